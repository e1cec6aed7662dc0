"""Instruments of the mechanism study, run on finished workdirs: the ViT's representations, Adam's
state and the Hessian's spectrum."""
