from resumeq.cli import main

main()
