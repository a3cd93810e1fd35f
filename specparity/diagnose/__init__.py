"""``specparity diagnose``: from a served finding to its located cause, in process.

findings.py reads a served record's findings (each request judged ``diverged``);
tree.py runs the decision tree on one finding (reproduce, prefill, verify block,
bisect, first difference) through the probes and bisect the other commands use,
loading each checkpoint once, and returns one :class:`tree.Diagnosis` per finding.
"""
