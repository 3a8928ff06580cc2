"""The report floor: every section made from a manifest, rendered as markdown, HTML, terminal
tables, and the gate's JUnit and summary files."""
