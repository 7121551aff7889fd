"""What-if on silicon: hardware overlays with fewer SMs and their runner."""
