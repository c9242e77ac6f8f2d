"""Capacity: the measured steps and their verdicts (steps), the automatic search (search), and the
settle phase's record (settle_record).
"""
