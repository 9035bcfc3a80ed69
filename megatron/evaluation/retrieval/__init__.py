"""Retrieval at length: does the model use context past its training length? (prompts.py: passkey
and key-value needles at a length and depth; scoring.py: multiple choice by likelihood and greedy
generation from one forward; grid.py: the lengths x depths grid over ranks; summary.py: accuracy,
intervals, effective length.)"""
