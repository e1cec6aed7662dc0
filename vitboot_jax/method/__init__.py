"""The method: the jitted training step of every mode (steps), its losses, the gradient alignment
of the shared mode (align), the mechanism study's hint variants and DrLoc's auxiliary loss."""
