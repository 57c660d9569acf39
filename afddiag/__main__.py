from afddiag.cli import main

main()
