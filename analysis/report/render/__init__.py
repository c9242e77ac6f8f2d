"""report.md and report.html from a `Report`: the cells both share, the Markdown, the HTML and its
plots.
"""
