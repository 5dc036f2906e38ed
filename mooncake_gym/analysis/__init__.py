"""Analysis of workloads and clusters without a policy: bounds on what any policy can reach, cache hit-
rate analysis, and the cost model's calibration.
"""
