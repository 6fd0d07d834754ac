"""Differential privacy shared by every generation method: events, the accountant,
calibration of noise from a budget, and the OpenDP noise samplers."""
