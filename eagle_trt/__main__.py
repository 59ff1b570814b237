from eagle_trt.cli.app import main

main()
