"""Routing over direct-connect topologies: coin change for AllReduce rings, k-shortest
paths and a min-max-load LP for MP traffic, and the metrics of routed traffic."""
