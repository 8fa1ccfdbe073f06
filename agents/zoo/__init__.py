"""The model zoo: the tiny byte-level GPTs, their corpus, training, shipped weights and what they measure like."""
