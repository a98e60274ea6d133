"""REACT: runtime collective tuning against congestion (detection, transforms, feedback loop)."""
