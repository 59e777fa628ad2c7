"""probes: pure analyses on arrays (activation-store vectors, attention maps) and small probe models.

Kept light on purpose: import submodules directly, e.g. `from probes.edge import EdgeProbe`,
`from probes.layers import per_layer_scores`, `from probes.mdl import online_codelength`.
"""
