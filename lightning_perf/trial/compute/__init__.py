"""Compute settings a tune or trial round applies at run time (``matmul_precision``, ``compile``,
``channels_last``, ``fused_optimizer``; ``precision`` goes to the Trainer), and the figures beside their speed:
each round's training loss and compile time."""
