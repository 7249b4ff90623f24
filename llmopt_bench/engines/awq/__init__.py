"""AWQ 4-bit weights: the checkpoint made from the FP16 model, and where each stage's AWQ weights come
from."""
