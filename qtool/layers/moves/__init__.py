"""Layers that only move values (steps, channels, joins): their integers are their inputs',
moved (onto the output's grid where it differs)."""
