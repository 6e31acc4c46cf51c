"""Data: load (line-numbered errors) -> clean (declared rules) -> version (hashes) -> split
(sealed test) -> audit (duplicates, leakage, labels, truncation) -> inspect (tokens + loss mask).
"""
