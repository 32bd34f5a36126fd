"""Rendering results: the text report, qualification records, HTML, SVG plots, JUnit XML."""
