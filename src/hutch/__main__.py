from hutch.main import main

main()
