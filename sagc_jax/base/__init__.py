"""What every part below the command line may use: the checks of config values."""
