import sys

from campaign.cli.main import main

sys.exit(main())
