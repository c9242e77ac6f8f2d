"""The report: its inputs, the evaluation of each scenario, the evidence pulled from sources, its
assembly as a `analysis.model.Report`, and its pages (render).
"""
