"""Renderers: each turns one Analysis into one output (terminal, JSON, HTML) and computes nothing new."""
