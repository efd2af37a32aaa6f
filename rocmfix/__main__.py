from rocmfix.cli import main

main()
