"""Gradient estimators of a client's potential, the wrappers that make new ones from them (gradient
noise, SCAFFOLD control variates, conducive gradients), and the Gaussian surrogates of its density."""
