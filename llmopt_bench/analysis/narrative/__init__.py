"""The report's narrative: the journey's claims, the conclusions and the roofline in words, computed
from the numbers alone."""
