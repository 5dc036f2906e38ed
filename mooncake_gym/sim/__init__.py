"""The simulation layer: the prefix cache, the prefill pool, the decode pool, the routing simulator and
the cluster simulator, observation modes (what a policy sees) and the policy interface. Imports only
:mod:`mooncake_gym.model`.
"""
