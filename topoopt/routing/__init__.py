"""Routing over direct-connect topologies: coin change for AllReduce, k-shortest paths and an LP for MP."""
