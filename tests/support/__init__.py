"""Helpers the tests share: each is imported from here, never from another test module."""
