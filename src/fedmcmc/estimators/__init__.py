"""Gradient estimators of a client's potential and the Gaussian surrogates of its density."""
