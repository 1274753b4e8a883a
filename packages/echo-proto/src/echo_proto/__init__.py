"""ECHO package."""
