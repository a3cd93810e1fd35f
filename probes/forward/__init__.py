"""Forward-pass checks at temperature 0: block vs chain, the long walk, prefill parity (see ``probes/__init__``)."""
