"""ACRB: Attribute-Conditioned Refusal Bias audits for image generation and editing models."""

__version__ = "0.1.0"
