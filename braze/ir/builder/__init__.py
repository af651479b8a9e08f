"""Builder mixins: the public op surface of `Graph`, one file per op family."""
