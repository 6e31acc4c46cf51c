from tunepilot.cli import main

main()
