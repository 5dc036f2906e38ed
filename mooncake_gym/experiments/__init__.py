"""Experiments over many policies and seeds: ``compare`` (the main job's tables) and ``tune`` (knob
search).
"""
