"""Several hosts: one node of a torchrun run, its launcher, the rendezvous store and the clock offsets."""
