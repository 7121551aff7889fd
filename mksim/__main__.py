from mksim.cli import main

main()
