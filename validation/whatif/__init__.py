"""What-if on silicon (issue 16): hardware overlays with fewer SMs and their runner."""
