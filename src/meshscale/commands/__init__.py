"""One module per `meshscale` subcommand: argument parsing and printing only; the work lives elsewhere."""
