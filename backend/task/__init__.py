"""The visitor's task before launch: the task check (`check`), run in a bubblewrap sandbox on the panel's machine
(`sandbox`) or in a short job of the visitor's own (`check_job`), and the Hub dataset viewer client."""
