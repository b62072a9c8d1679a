"""medvqa entry point: `python run.py [group=option ...]` (see conf/ and README.md); the same
`@hydra.main` as the installed console script `medvqa-run` (medvqa/cli/run.py)."""

from medvqa.cli.run import main

if __name__ == "__main__":
    main()
