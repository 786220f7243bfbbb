"""The command line (the top of the package: nothing else imports it). `specdecode` runs cli.main.main."""
