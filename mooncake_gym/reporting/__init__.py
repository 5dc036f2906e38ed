"""Reporting: text and markdown tables, JSON output, plots, and the generated docs pages.
"""
