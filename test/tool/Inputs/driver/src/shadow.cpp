int shadowed(int a) {
  {
    int a = 2;
    return a;
  }
}
