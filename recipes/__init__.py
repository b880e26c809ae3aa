"""Recipes shipped with lite-verl (what a run trains); see lite_verl/config/presets.py."""
