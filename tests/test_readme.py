"""The README starts with the two commands, and CI runs exactly those (it reads them from the README)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_starts_with_the_main_job_and_the_test_command():
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    commands = [line.strip() for line in head.splitlines() if line.startswith("    ")]
    assert len(commands) == 2
    main_job, tests = commands
    assert "pip install torch==2.13.0" in main_job and main_job.endswith("pytest scenarios/ -n auto")
    assert "pip install torch==2.13.0" in tests and "pytest tests/" in tests


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and 'bash -c "$test_job"' in ci and 'bash -c "$main_job"' in ci
