"""``python -m infopt.cli`` runs the same command as ``infopt``."""

from infopt.cli.app import console

console()
