"""The model layer: the cost model (GPUs, models, prefill and decode times), the cluster presets,
workloads (traces, the synthetic generator), output-length prediction, and the limits on inputs.
Imports nothing else of the package.
"""
