"""Measurements over the records: goodput and saturation, quantile intervals, histograms, the two-
sample test, prefix-cache evidence.
"""
