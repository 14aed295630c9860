"""Weight-free detectors that read an editing outcome from pixels (see docs/detectors.md)."""
