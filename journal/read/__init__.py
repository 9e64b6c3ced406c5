"""Reading a journal: lines forwards and backwards, the crash-tolerant reader, following across rotation, parallel scans."""
