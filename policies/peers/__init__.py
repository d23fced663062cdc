"""Peer harnesses' context policies, one module each.

The package is the `ctxsim.policies` entry point: the registry (simulator/policy.py) finds
every module in it and imports one only when a policy it registers is built or listed, so a
new policy is one file with one registration, found with no other file touched.
"""
