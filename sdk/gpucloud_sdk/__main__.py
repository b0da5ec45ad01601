from gpucloud_sdk.cli import main

main()
