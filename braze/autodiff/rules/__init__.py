"""VJP / JVP rules, one module per op family; `registry.load_rules` imports every module here."""
