"""The qualification as JUnit XML, for CI systems that display test results."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from ..oracle.outcome import CaseStatus
from .qualification import Qualification, summary


def render(report: Qualification) -> str:
    counts = summary(report.cases)
    suite = ET.Element("testsuite", name="resilience qualification", tests=str(counts["total"]),
                       failures=str(counts.get(CaseStatus.FAILED, 0)), errors=str(counts.get(CaseStatus.ERROR, 0)),
                       skipped=str(counts.get(CaseStatus.SKIPPED, 0) + counts.get(CaseStatus.XFAILED, 0)),
                       time=f"{report.elapsed_s:.3f}", timestamp=report.started)
    properties = ET.SubElement(suite, "properties")
    env = report.environment
    for name, value in [("python", env.python), ("kernel", env.kernel), ("launcher", report.launcher),
                        *((f"version.{k}", v or "not installed") for k, v in env.libraries.items()),
                        ("checkpoint_fs", f"{env.mount.fs_type} {env.mount.options}" if env.mount else "unknown")]:
        ET.SubElement(properties, "property", name=name, value=str(value))
    for record in report.cases:
        case = ET.SubElement(suite, "testcase", classname=record.source, name=record.case_id,
                             time=f"{record.elapsed_s:.3f}")
        text = "\n".join([f"verdict {record.verdict}, expected {record.expected}", *record.findings,
                          f"replay: {record.replay}"])
        if record.status == CaseStatus.FAILED:
            ET.SubElement(case, "failure", message=record.reason, type=record.verdict or "failed").text = text
        elif record.status == CaseStatus.ERROR:
            ET.SubElement(case, "error", message=record.reason).text = text
        elif record.status in (CaseStatus.SKIPPED, CaseStatus.XFAILED):
            ET.SubElement(case, "skipped", message=record.reason)
        ET.SubElement(case, "system-out").text = text
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)
